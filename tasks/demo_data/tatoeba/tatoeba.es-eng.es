Este campo es obligatorio.
Dirección IP
tipo de contenido
Este año
Cualquier fecha
Introduzca un número entero.
Fecha (con hora)
Este mes
Ruta de fichero
Chino tradicional
El fichero enviado está vacío.
Fecha (sin hora)
Introduzca un valor válido.
redireccionar desde
Chino simplificado
Número decimal
Restablecer contraseña
Introduzca sólo dígitos separados por comas.
Este campo no puede ser nulo.
Introduzca un número.
nombre a mostrar
Últimos 7 días
Introduzca una lista de valores.
Introduzca una URL válida.
No se ha enviado ningún fichero
fecha de caducidad
nombre de dominio
Booleano (Verdadero o Falso)
Introduzca una fecha válida.
Cambiar contraseña
Error en la base de datos
Introduzca una fecha/hora válida.
Español de Argentina
Inglés británico
Enteros separados por coma
clave de sesión
Introduzca una hora válida.
datos de sesión
Todas las fechas
Envíe una imagen válida. El fichero que ha enviado no era una imagen o se trataba de una imagen corrupta.
Nynorsk
No se ha enviado ningún fichero. Compruebe el tipo de codificación en el formulario.
Error del servidor
Correo electrónico
hora de la acción
Error de servidor (500)
Español de México
Booleano (Verdadero, Falso o Nulo)
entrada de registro
Error del servidor (500)
Cambio de contraseña
Este campo no puede estar vacío.
Sitio administrativo
mensaje de cambio
Página no encontrada
entradas de registro
Portugués de Brasil
id del objeto
Confirme contraseña:
redireccionar a
Mostrar todo
Campo de tipo:
marca de acción
Asegúrese de que este valor es menor o igual a.
con este ya existe.
Contraseña nueva:
Asegúrese de que este valor es mayor o igual a.
Ver en el sitio
Asegúrese de que este valor es (actualmente es).
tipos de contenido
Contraseña (confirmación)
Cambiar mi contraseña
Serbio latino
Español de Nicaragua
Su contraseña ha sido cambiada.
Seleccione a modificar
Escoja una opción válida. Esa opción no está entre las disponibles.
Cadena (máximo)
Contraseña nueva
No ha cambiado ningún campo.
¡Gracias por usar nuestro sitio!
último inicio de sesión
Sitio de administración de Django
Fechas importantes
Guardar como nuevo
Introduzca una dirección de correo electrónico válida.
Histórico de modificaciones:
Ya existe un usuario con este nombre.
Escoja una opción válida. no es una de las opciones disponibles.
Elija una hora
Administración de Django
Información personal
Restablecer mi contraseña
Iniciar sesión de nuevo
No se ha indicado el mes
Por favor, corrija los valores duplicados abajo.
Relación uno-a-uno
No se ha indicado el día
Esta cuenta está inactiva.
Guardar y continuar editando
No se ha indicado la semana
Eliminado/s satisfactoriamente.
nombre de la clase modelo de python
Relación muchos-a-muchos
No se ha indicado el año
Guardar y añadir otro
Número en coma flotante
Por favor, corrija el dato duplicado para.
Por favor envíe un fichero o marque la casilla de limpiar, pero no ambos.
Eliminar seleccionado/s
Ninguno disponible
El equipo de
nombre
Seleccionar todos los
Por favor corrija el dato duplicado para, ya que debe ser único.
No se seleccionó ninguna acción.
Clave foránea (tipo determinado por el campo relacionado)
No se puede eliminar
Sesión terminada
Se requiere registro
permisos de usuario
Limpiar selección
Agregar adicional.
Ejecutar la acción seleccionada
Contraseña antigua
Dirección IPv4
Entero grande (8 bytes)
apellidos
Seleccionar todos
Cambiar contraseña:
fecha de alta
habilitar comentarios
Confirmación de restablecimiento de contraseña
Español de Venezuela
No disponibles
Contraseña nueva (confirmación)
No se encontró ningún coincidente con la consulta
es staff
repr del objeto
Entero positivo
seleccionados 0 de
La contraseña se ha cambiado con éxito.
Entero positivo corto
Entero corto
Contenido desconocido
estado de superusuario
nombre de plantilla
número de
Por favor corrija los datos duplicados para ya que debe ser único para en.
Por favor, vaya a la página siguiente y escoja una nueva contraseña.
Introduzca una nueva contraseña para el usuario.
El nombre de dominio no puede contener espacios ni tabulaciones
Su contraseña ha sido establecida. Ahora puede continuar e iniciar sesión.
Se deben seleccionar elementos para poder realizar acciones sobre estos. No se han modificado elementos.
Por favor, introduzca su contraseña nueva dos veces para verificar que la ha escrito correctamente.
Si está marcado, sólo los usuarios registrados podrán ver la página.
Los futuros no están disponibles porque.allow_future es Falso.
Documentación para esta página
Los índices de directorio no están permitidos.
El enlace de restablecimiento de contraseña era inválido, seguramente porque se haya usado antes. Por favor, solicite un nuevo restablecimiento de contraseña.
Eliminar el provocaría la eliminación de objetos relacionados, pero su cuenta no tiene permiso para borrar los siguientes tipos de objetos:
Pulse aquí para seleccionar los objetos a través de todas las páginas
Slug (hasta)
Tipo de geometría inválido.
Opciones avanzadas
Índice de
Indica que este usuario tiene todos los permisos sin asignárselos explícitamente.
Su contraseña antigua es incorrecta. Por favor, vuelva a introducirla.
Eliminar múltiples objetos.
Correo electrónico:
No se indico ningún valor de geometría.
Indica si el usuario puede entrar en este sitio de administración.
¿Está seguro de que quiere borrar los? Se borrarán los siguientes objetos relacionados:
Valor de geometría inválido.
No se ha establecido la clave.
dirección de correo electrónico
fué modificado con éxito.
Formato de clave incorrecto o algoritmo de hash desconocido.
de seleccionado
Tiene cambios sin guardar en campos editables individuales. Si ejecuta una acción, los cambios no guardados se perderán.
los objetos relacionados `. `
Inglés australiano
Bookmarklets de documentación
no parece ser un objeto urlpattern
El objeto de tipo de contenido no tiene ningún modelo asociado.
Contraseña cambiada correctamente
Indica si el usuario debe ser tratado como activo. Desmarque esta opción en lugar de borrar la cuenta.
La eliminación de seleccionado requeriría el borrado de los siguientes objetos protegidos relacionados:
el objeto relacionado `. `
El modelo no se ha encontrado en la aplicación
Eliminar del ordenación
¿Está usted seguro que quiere eliminar el seleccionado? Todos los siguientes objetos y sus elementos relacionados serán borrados:
Este valor solo puede contener letras, números, puntos, guiones bajos o medios, barras o tildes.
Eliminar todos
Por favor, introduzca un y clave correctos. Observe que ambos campos pueden ser sensibles a mayúsculas.
Escriba la nueva contraseña
Lo lleva desde cualquier página a la documentación de la vista que la genera.
Por favor introduzca el y la clave correctos para una cuenta de personal. Observe que ambos campos pueden ser sensibles a mayúsculas.
Colección de "Geometry"
Introduzca un número entero válido.
El fue eliminado con éxito.
páginas estáticas
página estática
Tiene fecha
Contraseña restablecida en
Ha recibido este correo electrónico porque ha solicitado restablecer la contraseña para su cuenta en.
Datos binarios en bruto
Objeto de registro de Log
(Campo oculto) *
Página inválida:
Por favor, corrija el siguiente error.
La eliminación del seleccionado resultaría en el borrado de objetos relacionados, pero su cuenta no tiene permisos para borrar los siguientes tipos de objetos:
Ocurrió un error al transformar la geometria al SRID de la geometria del campo de formulario.
Escriba en este cuadro para filtrar la lista de disponibles
Español de Colombia
Polígono múltiple
Permisos específicos para este usuario.
A la URL le falta la barra inicial.
Cadena de línea
Modelos en la aplicación
Restablecimiento de contraseña completado
Restablecimiento de contraseñas fallido
Archivos estáticos
Activar la ordenación
Prioridad de la ordenación:
Asegúrese de que este valor tenga menos de caracter (tiene).
A la URL le falta la barra final.
Mapas del sitio
Introduzca un valor completo.
Asegúrese de que este valor tenga al menos caracter (tiene).
¿Estás seguro?
Valor no es una opción válida.
Este número de página es menor que 1
Autenticación y autorización
Asegúrese de que no haya más de dígito antes del punto decimal
Asegúrese de que este nombre de archivo tenga como máximo caracter (tiene).
Introduzca una duración válida.
Asegúrese de que no haya más de dígito decimal.
desde ahora
Más información disponible si se establece DEBUG=True.
Tipos de contenido
Asegúrese de que no hay más de dígito en total.
hace un segundo
Para verificar, introduzca la misma contraseña anterior.
hace un minuto
Esa página no contiene resultados
No es una dirección IPv6 válida.
La verificación CSRF ha fallado. Solicitud abortada.
Mis acciones
No se han registrado canales de contenido.
Ver el sitio
Introduzca un UUID válido.
En el sitio ya hay una pagina estática con la url
Este número de página no es un entero
Cadena de línea múltiple
Esta contraseña es completamente numérica.
Gaélico Escocés
hace una hora
Bajo sorbio
una hora a partir de ahora
La contraseña es demasiado similar a la de.
Nota: Usted esta a horas por delante de la hora del servidor.
un minuto a partir de ahora
el objeto con clave primaria no existe.
No, llévame atrás
Alto sorbio
Restablecimiento de contraseña enviado
debe ser único para.
Nota: Usted esta a hora de retraso de tiempo de servidor.
Esta contraseña es demasiado común.
Acciones recientes
Estás viendo este mensaje porqué esta web requiere una cookie CSRF cuando se envían formularios. Esta cookie se necesita por razones de seguridad, para asegurar que tu navegador no ha sido comprometido por terceras partes.
Bokmål noruego
un segundo a partir de ahora
Elija una Hora
coste de tiempo
Los caracteres nulos no están permitidos.
Los grupos a los que pertenece este usuario. Un usuario tendrá todos los permisos asignados a cada uno de sus grupos.
factor trabajo
Elija una Fecha
Cambiar seleccionados
Se ha autenticado como, pero no está autorizado a acceder a esta página. ¿Desea autenticarse con una cuenta diferente?
Extensiones de PostgreSQL
Su contraseña debe contener al menos caracter.
relaciones -
Puede volverlo a editar otra vez a continuación.
Requerido. 150 carácteres como máximo. Únicamente letras, dígitos y @/./+/-/_
relación -
Guardar y ver
Introduzca dos valores válidos.
Ingrese dos números.
Comienza con Django
Ingrese dos números enteros.
No vacío
Ingrese dos fechas válidas.
Eliminado “.”
Introduza un nombre de usuario válido. Este valor puede contener únicamente letras, números y los caracteres @/./+/-/_
coste de memoria
